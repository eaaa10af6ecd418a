#!/bin/bash
ls > files.txt
