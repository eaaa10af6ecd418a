#!/bin/bash
ln -s target.txt link.txt
