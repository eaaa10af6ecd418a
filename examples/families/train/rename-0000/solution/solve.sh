#!/bin/bash
mv list.txt result.txt
