#!/bin/bash
mv notes.txt report.txt
